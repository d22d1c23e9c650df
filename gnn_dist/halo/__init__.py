"""The halo layer: which rows a rank's peers need, and moving them.

    plan              the halo plan of a part (`HaloPlan`): send lists and receive counts, built once
    exchange          the differentiable exchange (`HaloExchanger`), its byte counters, a schedule per pass
    exact             the exact exchange as a schedule object (the default, evaluation, the guard's fallback)
    blocks            --halo-memory sequential: the operator cut into halo blocks moved one at a time
    attention_blocks  attention (GAT) over sequential halo blocks
    overlap           the exact exchange overlapped with the owned rows' product
    shared            the exact exchange through one host's shared memory

May import: comm, device, kernels, partition
"""
