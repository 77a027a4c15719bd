"""What a guest NIC may send and receive, kept on each host: the GuestFirewall interface
(guest_firewall.py), the nftables table as text (nft_ruleset.py), the real one by `nft -f -`
(nft_guest_firewall.py), the fake (fake_guest_firewall.py), which one a libvirt URI gets
(guest_firewall_choice.py) and what a bridge learns from a guest's frames (bridge_ports.py). The
libvirt hook that writes the rules at each start is libvirt/guest_rules_hook.py. Imports subp and
files/ (the ssh channel to a remote host) only."""
