"""Modules kept so that code written for pytorch-metric-learning 2.x keeps importing."""
