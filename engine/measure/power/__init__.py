"""Power at the wall: sensors behind one interface, a drift-free sampler, the energy ledger."""
