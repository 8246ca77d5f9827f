"""Generated stubs of the vendored Open Inference Protocol (package `inference`): see README.md."""
