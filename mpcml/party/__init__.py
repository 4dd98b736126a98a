"""The party daemon (`daemon`), its config and data catalogue, and the job worker it spawns."""
