"""The Python job API: `Client` talks to the coordinator, `Job` describes a job."""
