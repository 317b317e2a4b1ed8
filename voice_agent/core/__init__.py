"""The sans-I/O call core: turn-taking, playback and the interruption tracker, fed with events."""
