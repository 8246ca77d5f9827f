"""Release bundles: the trained network, its privacy card and its training record.

A bundle is a directory written once, atomically (a temporary sibling directory renamed into
place), by the trainer, and read by the server. It holds

* ``weights.npz``: the model of the released mean function, of one of three kinds behind one
  interface (:class:`Model`: ``q_values_unit(x) -> (n, m)``), which the server serves alike:

  - ``mlp`` (Algorithm 1 modes): ``W0, b0, W1, b1, ...`` of an MLP on the UNIT state x in
    [0, 1] (input shape (1,)) with m outputs; each W has shape (out, in), a layer is
    ``h @ W.T + b`` and ReLU sits between layers (``card["network"]["activation"]``);
  - ``grid`` (1-D fqi releases of the retired grid fit; read and served, no longer
    written): ``grid`` (K,) unit states and ``values`` (K, m), the released mean function
    L(Q_T) at the grid points, linearly interpolated in between (``card["model"]``);
  - ``additive`` (the `fqi` mode's kernel estimator, d coordinates): ``inducing``
    (M,), ``betas`` (d,), ``alpha`` (m, d, M) and ``centre`` (): the released mean function
    f_a(x) = centre + sum_j sum_l alpha[a, j, l] exp(-beta_j |x_j - inducing_l|) on unit
    states x in [0, 1]^d (:class:`KernelModel`); the card has ``state_intervals`` (one
    [lo, hi] per coordinate; states outside are clipped) and ``betas``;
* ``card.json``: the PUBLIC card, what a query client may see (:data:`PUBLIC_CARD_KEYS`, an
  allow-list of purely public parameters: none of them is a function of the trained weights);
* ``card_admin.json``: the rest of the card (weights hash, measured Lipschitz constants, the
  network layout, hyperparameters, training record, ``card_sha256``), for the admin role only.
  :attr:`Bundle.card` is the two merged; ``card_sha256`` covers the merged card, so editing
  either file is detected;
* ``config.toml`` (the training configuration), ``training_log.csv`` (per-episode return)
  and ``learning_curve.png``;
* ``noise.key``: the release's one noise key (32 bytes from OS entropy, drawn when the bundle
  is written by ``qveil train`` or ``qveil admin retrain``): every answer is a pure function
  of the weights, this key and the state (:mod:`qveil.keyed`). As secret as the weights; the
  card commits to it (``key_sha256``);
* ``receipt.json``: the registry's signed receipt of the release's charge
  (:mod:`qveil.bundle.receipt`), written by ``qveil train`` right after the bundle;
  ``qveil serve`` refuses a bundle without a receipt it trusts.

:func:`load_bundle` with ``verify=True`` (the default) refuses a bundle whose weights do not
match ``weights_sha256``, whose card does not match ``card_sha256`` (a checksum against
accidental or careless edits; it is not a signature), whose network is not L-Lipschitz in x,
or whose privacy numbers differ from what the accountant computes *now* from the card's own
``privacy_params`` (non-negotiable 6): ``qveil.privacy.account`` is rerun on every load.

The package needs numpy only (no torch): the server imports it. One module per job:
:mod:`~qveil.bundle.card` (the card, its allow-list and builders), :mod:`~qveil.bundle.models`
(the model kinds), :mod:`~qveil.bundle.layout` (the file names), :mod:`~qveil.bundle.io`
(writing and reading), :mod:`~qveil.bundle.verify` (checksums, Lipschitz bound, privacy
re-check) and :mod:`~qveil.bundle.receipt` (``receipt.json``).
"""

from __future__ import annotations

from qveil.bundle.card import (
    CARD_KEYS,
    CLIPPING,
    FQI_CARD_KEYS,
    KERNEL_CARD_KEYS,
    PUBLIC_CARD_KEYS,
    build_card,
    build_kernel_fqi_card,
    card_betas,
    card_box,
    card_digest,
    is_kernel_card,
    merge_card,
    nonprivate_privacy,
    public_card_of,
    split_card,
    value_scale_warning,
)
from qveil.bundle.io import (
    Bundle,
    load_bundle,
    write_bundle,
    write_kernel_bundle,
)
from qveil.bundle.layout import (
    ADMIN_CARD_FILE,
    CARD_FILE,
    CONFIG_FILE,
    CURVE_FILE,
    FILES,
    KEY_FILE,
    LOG_FILE,
    RECEIPT_FILE,
    WEIGHTS_FILE,
)
from qveil.bundle.models import (
    GridModel,
    KernelModel,
    MLPModel,
    Model,
    lipschitz_bound,
    measured_lipschitz,
    mlp_forward,
)
from qveil.bundle.verify import verify_privacy

__all__ = [
    "ADMIN_CARD_FILE",
    "CARD_FILE",
    "CARD_KEYS",
    "CLIPPING",
    "CONFIG_FILE",
    "CURVE_FILE",
    "FILES",
    "FQI_CARD_KEYS",
    "KEY_FILE",
    "KERNEL_CARD_KEYS",
    "LOG_FILE",
    "PUBLIC_CARD_KEYS",
    "RECEIPT_FILE",
    "WEIGHTS_FILE",
    "Bundle",
    "GridModel",
    "KernelModel",
    "MLPModel",
    "Model",
    "build_card",
    "build_kernel_fqi_card",
    "card_betas",
    "card_box",
    "card_digest",
    "is_kernel_card",
    "lipschitz_bound",
    "load_bundle",
    "measured_lipschitz",
    "merge_card",
    "mlp_forward",
    "nonprivate_privacy",
    "public_card_of",
    "split_card",
    "value_scale_warning",
    "verify_privacy",
    "write_bundle",
    "write_kernel_bundle",
]
