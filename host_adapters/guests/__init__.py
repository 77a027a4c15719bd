"""What a guest is told, shares and prints: its GuestSpec (guest.py), its NoCloud seed (seed.py),
whether virtiofsd can confine its home shares (virtiofs.py: interface, real, fake) and its serial
console's output as read (console.py). Imports subp and names only: hypervisor.py builds on it."""
