"""Exports of a DeploymentSpec to other platforms (Kubernetes manifests)."""
