"""Evaluation of generated samples: FID, domain FID, Inception Score and downstream utility."""
