"""The benchmark suite's machinery (bench/run.py): scenarios, targets, statistics, the machine, records, the plot.

Nothing here imports a GPU library: the runner stays free of CUDA so that a scenario's fresh processes find the
device idle. Each scenario is a module of bench/scenarios/.
"""
