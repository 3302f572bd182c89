"""A process's own peak RSS, for the memory tests that run a command in a child interpreter.

``getrusage(RUSAGE_SELF).ru_maxrss`` is the wrong number there: Linux keeps the high-water mark across
``execve``, so a child started from a pytest worker that already holds 1 GB of models reports at least that
1 GB (a compare test read 1091 MB for a 229 MB process).  ``VmHWM`` in ``/proc/self/status`` belongs to the
process's current address space, which ``execve`` replaces, so it counts the child alone.  Elsewhere (no
``/proc``) ``ru_maxrss`` is the fallback, in bytes (KiB on Linux, bytes on macOS).

``PEAK_RSS_CODE`` is source text: child scripts paste it in and call ``peak_rss_bytes()``.
"""

from __future__ import annotations

PEAK_RSS_CODE = '''
def peak_rss_bytes():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource, sys
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
'''

namespace: dict[str, object] = {}
exec(PEAK_RSS_CODE, namespace)  # the same function in this process, for the test of the rule itself
peak_rss_bytes = namespace["peak_rss_bytes"]
