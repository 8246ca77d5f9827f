"""The private data an estimator fits, as the estimators see it: :class:`TrainingData`.

Both kinds of dataset satisfy it: :class:`qveil.dataset.Dataset` (validated arrays in
memory) and :class:`qveil.dataset_parquet.ParquetSource` (a Parquet file opened by its
metadata, its rows streamed one row group of whole users at a time, each a
:class:`qveil.transitions.Transitions`). What the protocol names is public metadata, read
before any row: the accountant plans from it (N users, m actions, d coordinates, the reward
range), and the fit then reads the rows its own way.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["TrainingData"]


class TrainingData(Protocol):
    """A population's dataset as a fit receives it (the module docstring)."""

    @property
    def users(self) -> int:
        """N: the number of users (the user-level relation's unit)."""

    @property
    def n_actions(self) -> int:
        """m: the number of discrete actions."""

    @property
    def d(self) -> int:
        """The number of state coordinates."""

    @property
    def reward_range(self) -> tuple[float, float]:
        """The declared public range [lo, hi] of every reward."""

    @property
    def env_id(self) -> str | None:
        """The environment the data was collected in, if declared."""

    @property
    def population(self) -> str | None:
        """The population whose budget every release trained on the data is charged to."""

    @property
    def rewards_are_population_averages(self) -> bool:
        """Declared: every reward is the mean of the N users' reward functions (the
        ``reward`` neighbour relation needs it)."""

    def fingerprint(self) -> str:
        """The data's identity (SHA-256 of its canonical content)."""
