"""laggard.dashboards."""
