"""Where engine workers run (a local process, a thread for an attached server's client, a Ray actor) and the loop that
drives each one and journals every result as it arrives."""
