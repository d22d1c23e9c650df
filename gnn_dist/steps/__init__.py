"""What a rank does in an epoch of training.

    layer_stack   the L-layer model of a rank (`LayerStack`): dropout, conv, BatchNorm and ReLU per layer
    state         the rank's training state (`RankState`) and the reductions over ranks
    mode          what a training mode is (`--mode full|sampled`): the protocol the epoch loop drives
    full_batch    one optimiser step per epoch over the whole part
    mini_batch    sampled mini-batches: the sampler, remote features, a step per batch
    gradients     the flat buffer every gradient travels in (one Allreduce); flat: parameters as one buffer
    evaluation    exact, layer-wise evaluation over chunks of owned nodes

May import: comm, config, context, device, graph, halo, kernels, memory, metrics, models, nn, schedules
"""
