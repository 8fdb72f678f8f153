"""Verifying: launch the engine, load it at the limits, classify its log; the fit loop.

Every launch runs in its own process group and dies with oominfer.
"""
