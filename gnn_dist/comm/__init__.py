"""The communication layer: the only code that talks to other ranks or hosts.

    communicator     the MPI communicator (`Comm`, `MPIComm`, `make_world_comm`): the only module importing mpi4py
    simulated_ranks  P ranks as threads of one process (`run_fake_ranks`), for tests and single-process runs
    simulated_link   --simulate-link: a modelled network wrapped around a communicator
    staging          device tensors through pinned host buffers (--device cuda)
    codec            --halo-dtype: what a halo row becomes on the wire
    hosts            the hosts a supervised job may run on, and which of them answer
    peers            who is lost when a job dies: ring neighbours watched over plain TCP

May import: nothing of gnn_dist
"""
