"""Job specs: what they mean (`spec`, `order`) and what makes one valid (`validate`)."""
