"""The names every layer spells (metrics, tags, files), atomic file writes, and interrupt handling:
what the rest of the package stands on. Imports nothing of the package but `pipeline.errors`.
"""
