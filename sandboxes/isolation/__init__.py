"""What confines a host-local sandbox: cgroup limits and kills (`cgroups`), its sized
writable filesystem (`disk`) and the bubblewrap seccomp filter (`seccomp`)."""
