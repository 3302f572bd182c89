"""Seeded training recipes for the built-in trained models (``make train-shapes``).

Each recipe builds its dataset from :mod:`difforge.shapes`, trains difforge's own model classes and
writes a folder in the real checkpoint layout (safetensors only) that
:mod:`difforge.models.trained` ships.  Nothing here runs at inference time.
"""
