"""The workflows the commands run: a whole sweep of a grid (`runner`) and registering its best model
(`registry`).
"""
