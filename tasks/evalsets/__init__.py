"""Loaders for the nine evaluation tasks, shared by decontamination and evaluation."""
