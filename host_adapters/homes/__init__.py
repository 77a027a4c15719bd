"""Each account's home directory and its quota: the HomeVolumes interface, the real one and the
fake (homes.py); the QuotaBackend interface and NoQuota (quota.py), one module per backend
(btrfs_quota.py, xfs_quota.py, setquota.py, command_quota.py with program_path.py), the fake
(fake_quota.py) and which one `[volumes] quota_backend` names (quota_backends.py). Imports subp,
names and fail_on only."""
