"""The hardware model: GPUs, model shapes and the roofline that prices one scheduler step.

It sits above `sched` (it implements sched's StepCostModel) and below `engines` and `plan`: the sim
engine times its steps with it and the planner prices whole deployments with it.
"""
