"""Parallelism applied from outside the model: process groups (state), launch, TP (tensor), EP
(expert), CP (context), DP + gradient buckets (data), and apply (single-device model <-> parallel
form). See docs/PARALLELISM.md."""
