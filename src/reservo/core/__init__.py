"""Shared primitives. Imports no business module."""
