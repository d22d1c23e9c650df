"""Predictions made before a run: what it will hold and send.

    memory    peak resident memory per rank (`plan_part`), walked tensor by tensor through set-up, a training
              step and evaluation; liveness: its units and walk; options: what it depends on (`PlanConfig`)
    host      the host's share of a GPU rank's plan
    traffic   the width each layer puts on the wire and the halo bytes a schedule sends per epoch
    link      the link task's share of the memory plan

May import: comm, config, halo, kernels, link, memory, models, nn, partition, schedules
"""
