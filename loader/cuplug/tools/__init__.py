"""The operator's tools: ``cuplug probe``/``doctor``/``inspect``/``warmup``/``new-backend``.

They sit on the runtime and the contract core; nothing imports them.
"""
