"""Job specs: what they mean (`spec`), what makes one valid (`validate`), the job file."""
