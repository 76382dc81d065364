"""Simulator: SWF traces through the same queue and matcher as the operator."""
