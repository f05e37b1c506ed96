"""A DDTree runtime that cannot be imported: stands for a release whose kernels are broken."""

raise ImportError("broken-runtime fixture: this DDTree runtime is deliberately broken (demo of probe + rollback)")
