"""Version of the stand-in.

The real package exposes ``torch_npu.version.__version__`` ('2.13.0' in the wheel these signatures
were checked against) and re-exports it as ``torch_npu.__version__``.  The ``+standin`` suffix keeps
a report or RunRecord made with the stand-in from being mistaken for a real Ascend run.
"""

__version__ = "2.13.0+standin"
