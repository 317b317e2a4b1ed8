"""Call control through the carriers' REST APIs: placing calls, their status callbacks,
transfers and hang-ups on Twilio, Telnyx, Plivo and Vonage."""
