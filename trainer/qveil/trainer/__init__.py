"""qveil.trainer: offline private deep Q-learning with functional noise (Algorithm 1 of
Wang & Hegde 2019) on Gymnasium environments with a bounded 1-D state and discrete actions.

Importing this package registers ``qveil/LineWalk-v0`` (the paper's Appendix E.1 environment)
with Gymnasium. Torch is imported only by the modules that train (network, algorithm, train).
"""

from qveil.trainer.env import ENV_ID, LineWalkEnv, register_envs

register_envs()

__all__ = ["ENV_ID", "LineWalkEnv", "register_envs"]
