"""What governs releases: the registry (population ledger, receipts), the admin records and
operations, retraining under the ledger and the audit."""
