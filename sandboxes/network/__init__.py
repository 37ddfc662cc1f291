"""What a sandbox may reach: the Gateway channel (`gateway_channel`), a task's allowlist
through relays (`egress_relay`) and a public docker sandbox's own network
(`docker_network`)."""
