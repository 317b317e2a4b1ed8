"""The agents a config defines, compiled once: registry.py."""
