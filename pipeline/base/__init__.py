"""The names every layer spells (metrics, tags, files), atomic file writes, interrupt handling, and
addresses as printed (secrets masked): what the rest of the package stands on. Imports nothing of the
package but `pipeline.errors`.
"""
