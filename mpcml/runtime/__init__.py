"""CrypTen integration: compatibility shims and starting CrypTen over the mpcml data plane."""
