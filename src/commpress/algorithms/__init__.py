"""Communication schedules as plain data: who sends which chunk to whom, step by step.

Nothing here imports torch.distributed; the executor in :mod:`commpress.collectives`
runs a schedule over a transport.
"""
