"""What a user asks for: the grid keys (`config.KEYS`, the one key table everything reads), a grid
file read into its points, the grid's JSON Schema, and the example grids `pipeline init` copies.
"""
