The ninth annual kite festival drew a crowd of about two thousand people to Saltmarsh beach.

Organisers said the wind was “perfect”

@highlight

About two thousand people came to the Saltmarsh kite festival
