"""qveil: private value-function release with functional (Gaussian-process) noise.

The package is split by role: ``qveil.noise`` and ``qveil.privacy`` hold the pure math
(sample paths, accountant) that every other part imports; ``qveil.client`` is the light SDK
(no torch); ``qveil.server`` the gRPC server and its sample-path store; ``qveil.trainer`` the
offline private Q-learning; ``qveil.v1`` the generated protobuf stubs.
"""

__version__ = "0.1.0"
