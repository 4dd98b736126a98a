"""The party daemon: its config, catalogue, policy, coordinator link and job workers."""
