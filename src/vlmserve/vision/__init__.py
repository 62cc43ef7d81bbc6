"""The image path's shared facts: how many tokens an image costs a given model, what an image is
(format and size, read from its header), and its content digest.

The gateway (limits, downscaling, routing), the bench (workloads), the sim engine and the planner
all price an image through this package, so they agree with each other and with the model's own
processor configuration.
"""
