"""Registers the image step classes (imported by python_backends/steps.py)."""
