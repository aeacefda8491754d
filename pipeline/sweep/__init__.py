"""The workflows the commands run: a whole sweep of a grid (`runner`), registering its best model
(`registry`), and publishing a sweep's comparison to the store (`publish`).
"""
