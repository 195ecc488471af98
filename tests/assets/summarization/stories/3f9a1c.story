Harbourton (Local Wire) -- The town council of Harbourton voted on Tuesday to reopen the old ferry pier after five years of repairs.

Photo: The pier at low tide

Council member Ada Okafor said the pier would open to walkers in June and to boats in August.

"We waited a long time for this," she said.

@highlight

Harbourton council votes to reopen the ferry pier

@highlight

Walkers may use it from June, boats from August
