"""A witness for journals: the witness server (``server``, ``apollia-os witness serve``).

The formats and the decisions are pure, in :mod:`apollia_nb.journal.witness`; the home's
sender of its checkpoints to its witnesses is :mod:`apollia_nb.journal.witness_sender`.
"""
