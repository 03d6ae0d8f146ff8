"""Registers the speech-synthesis step classes (imported by python_backends/steps.py)."""
