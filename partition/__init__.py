"""Graph loading, METIS partitioning and the on-disk partition format.

May import: comm, memory
"""
