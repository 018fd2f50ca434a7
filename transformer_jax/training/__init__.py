"""The pieces of a training run (paper §5): the schedule, the loss, the jitted step,
checkpoints, averaging, branching, the workdir and its metrics. Imports the layers below."""
