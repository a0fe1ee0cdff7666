"""What the steps mean, measured: the per-step analysis (the calibrated step-time fit, the batch-1 reference,
speedups, energy), prefill's model, power meters and sensors, side-cache probes and sweeps, rolling figures, a
request's share of the energy."""
