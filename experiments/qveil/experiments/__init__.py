"""qveil.experiments: reproductions of the seed papers' figures and checks.

``qveil experiments fig1|fig2|bgp16|theory`` (:mod:`qveil.experiments.commands.experiments`).
Modules: :mod:`~qveil.experiments.bgp16` and :mod:`~qveil.experiments.chain_mdp` (Balle, Gomrokchi &
Precup 2016), :mod:`~qveil.experiments.theory` (Wang & Hegde 2019, Lemma 8, Props. 9 and 10),
:mod:`~qveil.experiments.baselines` (DP-SGD, input perturbation, with their accountants),
:mod:`~qveil.experiments.linewalk`, :mod:`~qveil.experiments.fig1`, :mod:`~qveil.experiments.fig2`
(LineWalk runs through qveil.trainer) and :mod:`~qveil.experiments.plotting`. Results and how to
regenerate them: docs/results.md.
"""
