"""A grid point turned into a tracked run (`point`), and the executors that run points: in this
process, in worker processes, or as Ray tasks.
"""
