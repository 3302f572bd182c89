"""Tests of the shapes world, its checker and prompt sets."""
